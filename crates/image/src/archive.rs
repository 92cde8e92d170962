//! Tar archives read in place: `docker save` archives and OCI archives.
//!
//! An archive is never extracted: its members are indexed by name (offsets
//! and sizes, found by seeking over the tar), and the few members an import
//! needs are read where they are. Member names are only ever used as lookup
//! keys, never as file system paths, so entry modes (the read-only members
//! podman and skopeo write), absolute names and `..` cannot affect the host.
//! Links between members are followed inside the archive only.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use tracing::debug;

use crate::config::MAX_JSON_BYTES;
use crate::error::{io_err, src_err, ImageError};
use crate::unpack::{normalize_path, sniff_compression, Compression};

/// Links followed at most this many times when resolving a member.
const MAX_LINKS: usize = 16;

/// What an archive member is.
enum Member {
    File { offset: u64, size: u64 },
    Symlink(Vec<u8>),
    Hardlink(Vec<u8>),
}

/// A tar archive opened for reading members in place.
pub(crate) struct TarArchive {
    /// The (uncompressed) archive.
    file: File,
    /// Members by normalised name (later members win, as when extracting).
    members: HashMap<String, Member>,
    /// What the archive is, for messages (`docker archive`, `OCI archive`).
    what: &'static str,
    /// The decompressed copy of a gzipped archive, removed on drop.
    _tmp: Option<tempfile::TempDir>,
}

/// The normalised member name of a raw archive path (`./a//b/` is `a/b`).
pub(crate) fn key_of(raw: &[u8]) -> Result<String, String> {
    let comps = normalize_path(raw)?;
    let parts: Vec<_> = comps.iter().map(|c| String::from_utf8_lossy(c.to_bytes()).into_owned()).collect();
    Ok(parts.join("/"))
}

impl TarArchive {
    /// Opens the archive at `src` (plain or gzip) and indexes its members.
    ///
    /// A gzipped archive is first decompressed (at most `limit` bytes) into a
    /// temporary file in `staging` (the layer store's staging directory,
    /// cleared on restart) to allow seeking; it is removed when the archive
    /// is dropped.
    pub(crate) fn open(src: &Path, staging: &Path, limit: u64, what: &'static str) -> Result<Self, ImageError> {
        let mut file = File::open(src).map_err(src_err(src))?;
        let mut head = Vec::with_capacity(6);
        (&mut file).take(6).read_to_end(&mut head).map_err(src_err(src))?;
        file.seek(SeekFrom::Start(0)).map_err(src_err(src))?;

        let mut tmp = None;
        match sniff_compression(&head) {
            Compression::None => {}
            Compression::Gzip => {
                let dir = tempfile::Builder::new().prefix(".archive-").tempdir_in(staging).map_err(io_err(staging))?;
                let path = dir.path().join("archive.tar");
                let mut out =
                    File::options().read(true).write(true).create_new(true).open(&path).map_err(io_err(&path))?;
                let mut gz = MultiGzDecoder::new(BufReader::new(file)).take(limit.saturating_add(1));
                let n = io::copy(&mut gz, &mut out).map_err(|e| match e.kind() {
                    io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
                        ImageError::Corrupt { what: what.into(), source: e }
                    }
                    _ => io_err(&path)(e),
                })?;
                if n > limit {
                    return Err(ImageError::TooLarge { what: format!("decompressed {what}"), limit });
                }
                debug!(bytes = n, what, "decompressed archive");
                file = out;
                tmp = Some(dir);
            }
            Compression::Unsupported(name) => {
                return Err(ImageError::UnsupportedSource {
                    path: src.to_path_buf(),
                    reason: format!("{name}-compressed archives are not supported (use plain or gzip tar)"),
                })
            }
        }
        let members = index(&file, what)?;
        debug!(members = members.len(), what, "indexed archive");
        Ok(TarArchive { file, members, what, _tmp: tmp })
    }

    /// Whether the archive has a member called `name` (of any type).
    pub(crate) fn has(&self, name: &str) -> bool {
        key_of(name.as_bytes()).is_ok_and(|k| self.members.contains_key(&k))
    }

    /// Finds the data (offset, size) of member `name`, following links
    /// inside the archive (never above its root).
    pub(crate) fn resolve(&self, name: &str) -> Result<(u64, u64), ImageError> {
        let bad = |reason: String| ImageError::archive(self.what, format!("member {name:?}: {reason}"));
        let mut key = key_of(name.as_bytes()).map_err(bad)?;
        for _ in 0..MAX_LINKS {
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
    pub(crate) fn open_member(&self, name: &str) -> Result<(io::Take<File>, u64), ImageError> {
        let (offset, size) = self.resolve(name)?;
        let mut f = self.file.try_clone().map_err(io_err(self.what))?;
        f.seek(SeekFrom::Start(offset)).map_err(io_err(self.what))?;
        Ok((f.take(size), size))
    }

    /// Reads a small (JSON) member, at most [`MAX_JSON_BYTES`].
    pub(crate) fn read_small(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let (mut r, size) = self.open_member(name)?;
        if size > MAX_JSON_BYTES {
            return Err(ImageError::archive(self.what, format!("{name} is larger than {MAX_JSON_BYTES} bytes")));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        r.read_to_end(&mut bytes)
            .map_err(|source| ImageError::Corrupt { what: format!("{} member {name}", self.what), source })?;
        if bytes.len() as u64 != size {
            return Err(ImageError::archive(self.what, format!("{name} is truncated")));
        }
        Ok(bytes)
    }
}

/// Indexes the members of the uncompressed tar `file` by seeking over it.
fn index(file: &File, what: &'static str) -> Result<HashMap<String, Member>, ImageError> {
    let corrupt = |source| ImageError::Corrupt { what: what.into(), source };
    let mut members = HashMap::new();
    let mut file = file;
    file.seek(SeekFrom::Start(0)).map_err(io_err(what))?;
    let mut ar = tar::Archive::new(file);
    for entry in ar.entries_with_seek().map_err(corrupt)? {
        let entry = entry.map_err(corrupt)?;
        let raw = entry.path_bytes();
        let key = match key_of(&raw) {
            Ok(k) => k,
            Err(reason) => {
                debug!(member = %String::from_utf8_lossy(&raw), reason, what, "ignoring archive member");
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
    Ok(members)
}
