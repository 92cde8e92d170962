//! Recognising an import source by its content.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use tracing::debug;

use crate::config::MAX_JSON_BYTES;
use crate::docker::ManifestEntry;
use crate::error::{src_err, ImageError};
use crate::unpack::{normalize_path, sniff_compression, Compression};
use crate::SourceKind;

/// Tells what kind of image source `src` is, by inspecting it (not by its name):
///
/// * a directory with both `oci-layout` and `index.json`: [`SourceKind::OciLayout`];
/// * any other directory: [`SourceKind::RootfsDir`];
/// * a tar (optionally gzip-compressed) holding a `docker save` `manifest.json`
///   and only `docker save` members: [`SourceKind::DockerArchive`];
/// * any other tar or gzip-compressed tar: [`SourceKind::RootfsTar`].
///
/// Anything else (other compressions, tars of OCI layouts, non-archives) is
/// [`ImageError::UnsupportedSource`].
pub fn detect(src: &Path) -> Result<SourceKind, ImageError> {
    let md = fs::metadata(src).map_err(src_err(src))?;
    let unsupported = |reason: &str| ImageError::UnsupportedSource { path: src.to_path_buf(), reason: reason.into() };
    let kind = if md.is_dir() {
        let layout = src.join("oci-layout").is_file();
        let index = src.join("index.json").is_file();
        match (layout, index) {
            (true, true) => SourceKind::OciLayout,
            (true, false) => return Err(unsupported("directory has an oci-layout file but no index.json")),
            _ => SourceKind::RootfsDir,
        }
    } else if md.is_file() {
        detect_file(src)?
    } else {
        return Err(unsupported("neither a regular file nor a directory"));
    };
    debug!(src = %src.display(), %kind, "detected image source");
    Ok(kind)
}

fn detect_file(src: &Path) -> Result<SourceKind, ImageError> {
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
    match scan {
        Scan::Docker => Ok(SourceKind::DockerArchive),
        Scan::Rootfs => Ok(SourceKind::RootfsTar),
        Scan::OciArchive => {
            Err(unsupported("tar of an OCI image layout (oci-archive): extract it and import the directory".into()))
        }
        Scan::NotTar => Err(unsupported("not a tar archive, gzip-compressed tar archive or directory".into())),
    }
}

enum Scan {
    Docker,
    OciArchive,
    Rootfs,
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

/// Whether a (normalised) archive member path can appear in a `docker save`
/// archive (legacy `<id>/layer.tar` layout or the OCI-style one of Docker 25+).
fn is_docker_member(path: &str) -> bool {
    let is_hex64 = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let first = path.split('/').next().unwrap_or("");
    path.is_empty()
        || matches!(path, "manifest.json" | "repositories" | "index.json" | "oci-layout")
        || (path.ends_with(".json") && !path.contains('/'))
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
        return Err(Scan::Rootfs); // an empty tar
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
        Err(_) => Scan::Rootfs,
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
        Err(_) => Scan::Rootfs,
    }
}

/// A `docker save` archive only has docker members and a parsable
/// `manifest.json`. Stops at the first member a docker archive cannot have,
/// so a rootfs tarball is recognised after its first header.
fn scan_entries<R: Read>(entries: tar::Entries<'_, R>) -> Scan {
    let (mut oci_layout, mut index) = (false, false);
    for entry in entries {
        // Broken archives are reported by the import, with details.
        let Ok(mut entry) = entry else { return Scan::Rootfs };
        let Ok(comps) = normalize_path(&entry.path_bytes()) else { return Scan::Rootfs };
        let parts: Vec<_> = comps.iter().map(|c| String::from_utf8_lossy(c.to_bytes()).into_owned()).collect();
        let path = parts.join("/");
        if !is_docker_member(&path) {
            return Scan::Rootfs;
        }
        match path.as_str() {
            "manifest.json" if entry.header().entry_type().is_file() && entry.size() <= MAX_JSON_BYTES => {
                let mut bytes = Vec::new();
                if entry.read_to_end(&mut bytes).is_ok()
                    && serde_json::from_slice::<Vec<ManifestEntry>>(&bytes).is_ok_and(|m| !m.is_empty())
                {
                    return Scan::Docker;
                }
            }
            "oci-layout" => oci_layout = true,
            "index.json" => index = true,
            _ => {}
        }
    }
    if oci_layout && index {
        Scan::OciArchive
    } else {
        Scan::Rootfs
    }
}
