//! Recognising an import source by its content.
//!
//! A tar is an image archive when every member is one an image archive can
//! have (`manifest.json`, `repositories`, `index.json`, `oci-layout`,
//! top-level `*.json` and `<hex>.tar`, anything under `blobs/` or a `<hex>/`
//! directory) and it carries image metadata; the order of the members does
//! not matter (podman and skopeo write `manifest.json` last). The scan stops
//! at the first member no image archive has: that tar is a rootfs, unless
//! image metadata came before it (then it is rejected here) or appears at its
//! top level after it (then the rootfs import rejects it, see
//! [`IMAGE_METADATA`]).

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use tracing::debug;

use crate::archive::key_of;
use crate::config::MAX_JSON_BYTES;
use crate::docker::ManifestEntry;
use crate::error::{src_err, ImageError};
use crate::unpack::{sniff_compression, Compression};
use crate::SourceKind;

/// Top-level names of image metadata. A source holding one of them is an
/// image or is rejected: never imported as a rootfs, whose root would be the
/// archive's metadata and layer files.
pub(crate) const IMAGE_METADATA: [&str; 3] = ["manifest.json", "index.json", "oci-layout"];

/// Tells what kind of image source `src` is, by inspecting it (not by its name):
///
/// * a directory with both `oci-layout` and `index.json`: [`SourceKind::OciLayout`];
/// * a directory with only one of them, or with a `manifest.json` (an
///   extracted `docker save` archive): rejected;
/// * any other directory: [`SourceKind::RootfsDir`];
/// * a tar (optionally gzip-compressed) with only image archive members and a
///   `docker save` `manifest.json`: [`SourceKind::DockerArchive`] (also when
///   it is an OCI layout too, as Docker >= 25 writes them);
/// * such a tar with `oci-layout` and `index.json` but no `manifest.json`:
///   [`SourceKind::OciArchive`];
/// * such a tar with image metadata that is not a valid image (an unparsable
///   `manifest.json`, `index.json` without `oci-layout`, ...), or with image
///   metadata followed by other members: rejected;
/// * any other tar or gzip-compressed tar: [`SourceKind::RootfsTar`].
///
/// Rejections, other compressions and non-archives are
/// [`ImageError::UnsupportedSource`].
pub fn detect(src: &Path) -> Result<SourceKind, ImageError> {
    Ok(probe(src)?.kind)
}

/// What [`probe`] found.
pub(crate) struct Probe {
    /// The kind of source.
    pub kind: SourceKind,
    /// For a rootfs tarball: its first member that no image archive has.
    pub first_foreign: Option<String>,
}

/// [`detect`], also returning what made a tar a rootfs.
pub(crate) fn probe(src: &Path) -> Result<Probe, ImageError> {
    let md = fs::metadata(src).map_err(src_err(src))?;
    let unsupported = |reason: String| ImageError::UnsupportedSource { path: src.to_path_buf(), reason };
    let probe = if md.is_dir() {
        Probe { kind: detect_dir(src).map_err(unsupported)?, first_foreign: None }
    } else if md.is_file() {
        detect_file(src)?
    } else {
        return Err(unsupported("neither a regular file nor a directory".into()));
    };
    debug!(src = %src.display(), kind = %probe.kind, first_foreign = ?probe.first_foreign, "detected image source");
    Ok(probe)
}

fn detect_dir(src: &Path) -> Result<SourceKind, String> {
    let exists = |name: &str| fs::symlink_metadata(src.join(name)).is_ok();
    let (layout, index) = (src.join("oci-layout").is_file(), src.join("index.json").is_file());
    if layout && index {
        Ok(SourceKind::OciLayout)
    } else if layout {
        Err("directory has an oci-layout file but no index.json".into())
    } else if exists("oci-layout") || exists("index.json") {
        Err("directory has a top-level index.json or oci-layout but is not an OCI image layout \
             (both must be regular files); not imported as a rootfs"
            .into())
    } else if exists("manifest.json") {
        Err("directory has a top-level manifest.json (an extracted docker save archive?); \
             import the archive itself; not imported as a rootfs"
            .into())
    } else {
        Ok(SourceKind::RootfsDir)
    }
}

fn detect_file(src: &Path) -> Result<Probe, ImageError> {
    let unsupported = |reason: String| ImageError::UnsupportedSource { path: src.to_path_buf(), reason };
    let mut file = File::open(src).map_err(src_err(src))?;
    let mut head = Vec::with_capacity(6);
    (&mut file).take(6).read_to_end(&mut head).map_err(src_err(src))?;
    file.seek(SeekFrom::Start(0)).map_err(src_err(src))?;
    let scan = match sniff_compression(&head) {
        Compression::Gzip => scan_tar_stream(MultiGzDecoder::new(BufReader::new(file))),
        Compression::None => scan_tar_file(file),
        Compression::Unsupported(name) => {
            return Err(unsupported(format!("{name}-compressed archives are not supported (use plain or gzip tar)")))
        }
    };
    let kind = |kind| Ok(Probe { kind, first_foreign: None });
    match scan {
        Scan::Docker => kind(SourceKind::DockerArchive),
        Scan::OciArchive => kind(SourceKind::OciArchive),
        Scan::Rootfs { first_foreign } => Ok(Probe { kind: SourceKind::RootfsTar, first_foreign }),
        Scan::NotImage(reason) => Err(unsupported(format!("{reason}; not imported as a rootfs"))),
        Scan::NotTar => Err(unsupported("not a tar archive, gzip-compressed tar archive or directory".into())),
    }
}

enum Scan {
    Docker,
    OciArchive,
    Rootfs {
        first_foreign: Option<String>,
    },
    /// Image metadata, but not a valid image: why.
    NotImage(String),
    NotTar,
}

/// Whether a 512-byte block is a tar header with a valid checksum.
pub(crate) fn is_tar_header(block: &[u8]) -> bool {
    if block.len() < 512 {
        return false;
    }
    let field = &block[148..156];
    let digits: Vec<u8> =
        field.iter().copied().skip_while(|b| *b == b' ').take_while(|b| (b'0'..=b'7').contains(b)).collect();
    let Some(stored) = std::str::from_utf8(&digits).ok().and_then(|s| u32::from_str_radix(s, 8).ok()) else {
        return false;
    };
    let sum: u32 =
        block[..148].iter().chain(&block[156..512]).map(|b| u32::from(*b)).sum::<u32>() + 8 * u32::from(b' ');
    sum == stored
}

/// Whether a (normalised) member path can appear in an image archive:
/// `docker save` (legacy `<id>/layer.tar` + `<hex>.json`, podman's and
/// skopeo's `<hex>.tar` layers, Docker >= 25's OCI layout) or an OCI archive.
fn is_image_member(path: &str) -> bool {
    let is_hex64 = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let first = path.split('/').next().unwrap_or("");
    let top_level = !path.contains('/');
    path.is_empty()
        || matches!(path, "manifest.json" | "repositories" | "index.json" | "oci-layout")
        || (top_level && path.ends_with(".json"))
        || (top_level && path.strip_suffix(".tar").is_some_and(is_hex64))
        || first == "blobs"
        || is_hex64(first)
}

/// Reads the first tar block; `Err(scan)` when that already decides.
fn first_block(reader: &mut impl Read) -> Result<Vec<u8>, Scan> {
    let mut first = Vec::with_capacity(512);
    if reader.take(512).read_to_end(&mut first).is_err() || first.len() < 512 {
        return Err(Scan::NotTar);
    }
    if first.iter().all(|b| *b == 0) {
        return Err(Scan::Rootfs { first_foreign: None }); // an empty tar
    }
    if !is_tar_header(&first) {
        return Err(Scan::NotTar);
    }
    Ok(first)
}

/// Scans an uncompressed tar file, seeking over member data.
fn scan_tar_file(mut file: File) -> Scan {
    if let Err(scan) = first_block(&mut file) {
        return scan;
    }
    if file.seek(SeekFrom::Start(0)).is_err() {
        return Scan::NotTar;
    }
    let mut ar = tar::Archive::new(file);
    match ar.entries_with_seek() {
        Ok(entries) => scan_entries(entries),
        Err(_) => Scan::Rootfs { first_foreign: None },
    }
}

/// Scans a (decompressed) tar stream.
fn scan_tar_stream(mut reader: impl Read) -> Scan {
    let first = match first_block(&mut reader) {
        Ok(first) => first,
        Err(scan) => return scan,
    };
    let mut ar = tar::Archive::new(io::Cursor::new(first).chain(reader));
    match ar.entries() {
        Ok(entries) => scan_entries(entries),
        Err(_) => Scan::Rootfs { first_foreign: None },
    }
}

/// Image metadata seen so far.
#[derive(Default)]
struct Seen {
    /// Why the top-level `manifest.json` is not a `docker save` manifest.
    bad_manifest: Option<String>,
    oci_layout: bool,
    index: bool,
    repositories: bool,
}

impl Seen {
    /// The image metadata seen, for messages (empty if none).
    fn metadata(&self) -> Vec<&'static str> {
        let flags = [self.bad_manifest.is_some(), self.index, self.oci_layout];
        IMAGE_METADATA.iter().zip(flags).filter(|(_, seen)| *seen).map(|(name, _)| *name).collect()
    }

    /// The verdict on reaching `member`, which no image archive has.
    fn foreign(self, member: String) -> Scan {
        let metadata = self.metadata();
        if metadata.is_empty() {
            return Scan::Rootfs { first_foreign: Some(member) };
        }
        let mut reason = format!(
            "has a top-level {} like an image archive but also {member:?}, which no image archive has",
            metadata.join(" and ")
        );
        if let Some(why) = self.bad_manifest {
            reason.push_str(&format!(" (and manifest.json is not a docker save manifest: {why})"));
        }
        Scan::NotImage(reason)
    }

    /// The verdict when every member could be an image archive's.
    fn at_end(self) -> Scan {
        if let Some(why) = self.bad_manifest {
            return Scan::NotImage(format!("has a top-level manifest.json that is not a docker save manifest: {why}"));
        }
        match (self.oci_layout, self.index) {
            (true, true) => Scan::OciArchive,
            (true, false) => Scan::NotImage("has an oci-layout file but no index.json (not an OCI archive)".into()),
            (false, true) => Scan::NotImage("has an index.json but no oci-layout file (not an OCI archive)".into()),
            (false, false) if self.repositories => Scan::NotImage(
                "has a `repositories` file but no manifest.json: docker save archives of Docker < 1.10 are not \
                 supported"
                    .into(),
            ),
            (false, false) => Scan::Rootfs { first_foreign: None },
        }
    }
}

/// Why a top-level `manifest.json` member is not a `docker save` manifest
/// (`None`: it is one).
fn manifest_problem<R: Read>(entry: &mut tar::Entry<'_, R>) -> Option<String> {
    if !entry.header().entry_type().is_file() {
        return Some("not a regular file".into());
    }
    if entry.size() > MAX_JSON_BYTES {
        return Some(format!("larger than {MAX_JSON_BYTES} bytes"));
    }
    let mut bytes = Vec::new();
    if let Err(e) = entry.read_to_end(&mut bytes) {
        return Some(format!("unreadable: {e}"));
    }
    match serde_json::from_slice::<Vec<ManifestEntry>>(&bytes) {
        Ok(m) if m.is_empty() => Some("lists no images".into()),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Classifies a tar by its members, in whatever order they come: stops at a
/// valid `manifest.json` (a `docker save` archive) or at the first member no
/// image archive has.
fn scan_entries<R: Read>(entries: tar::Entries<'_, R>) -> Scan {
    let mut seen = Seen::default();
    for entry in entries {
        // Broken archives are reported by the import, with details.
        let Ok(mut entry) = entry else { return Scan::Rootfs { first_foreign: None } };
        let raw = entry.path_bytes().into_owned();
        let path = match key_of(&raw) {
            Ok(path) if is_image_member(&path) => path,
            Ok(path) => return seen.foreign(path),
            Err(_) => return seen.foreign(String::from_utf8_lossy(&raw).into_owned()),
        };
        match path.as_str() {
            "manifest.json" => match manifest_problem(&mut entry) {
                None => return Scan::Docker,
                Some(why) => seen.bad_manifest = Some(why),
            },
            "oci-layout" => seen.oci_layout = true,
            "index.json" => seen.index = true,
            "repositories" => seen.repositories = true,
            _ => {}
        }
    }
    seen.at_end()
}
