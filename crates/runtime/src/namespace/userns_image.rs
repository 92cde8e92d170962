//! The one place a CRIU process image names host ids: `userns-N.img`, the id
//! maps of a sandbox's user namespace (`UsernsEntry`, two repeated
//! `UidGidExtent { first, lower_first, count }` in CRIU's `userns.proto`).
//! A warm fork restores another sandbox's image into a range of its own, so
//! the restore reads this file, and writes a copy whose `lower_first` fields
//! name the fork's range (credentials, tmpfs archives and mount options in
//! the other images are in-namespace ids and stay as they are).
//!
//! The file is CRIU's image framing (a common magic, the USERNS magic, then
//! each entry as a little-endian u32 length and its protobuf bytes) around
//! one protobuf message, decoded and encoded here field by field: any field
//! or wire type this format does not have is refused, never dropped.

use std::path::{Path, PathBuf};

/// CRIU's magic of images that belong to a dump (`IMG_COMMON_MAGIC`).
const COMMON_MAGIC: u32 = 0x5456_4319;
/// CRIU's magic of `userns-N.img` (`USERNS_MAGIC`).
const USERNS_MAGIC: u32 = 0x5547_4906;
/// Larger than any id map CRIU writes (at most 340 extents of 3 varints each).
const MAX_ENTRY: usize = 64 * 1024;

/// One line of a uid or gid map: ids `first..first+count` inside are host
/// ids `lower_first..lower_first+count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First id inside the namespace.
    pub first: u32,
    /// The host id it maps to.
    pub lower_first: u32,
    /// How many ids.
    pub count: u32,
}

/// The id maps a process image's user namespace had.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsernsMaps {
    /// uid_map lines.
    pub uid: Vec<Extent>,
    /// gid_map lines.
    pub gid: Vec<Extent>,
}

/// Why an image's user namespace cannot be read or moved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsernsImageError {
    /// The file is not what CRIU writes.
    #[error("{0}")]
    Malformed(String),
    /// The maps are not one range starting at id 0, as strata writes them.
    #[error("the image's user namespace maps {0}, not one range from id 0")]
    NotOneRange(String),
}

impl UsernsMaps {
    /// The host id of the namespace's root and how many ids follow it, when
    /// both maps are the single range from 0 that strata gives every sandbox.
    pub fn range(&self) -> Result<(u32, u32), UsernsImageError> {
        match (self.uid.as_slice(), self.gid.as_slice()) {
            ([u], [g]) if u.first == 0 && u == g => Ok((u.lower_first, u.count)),
            _ => Err(UsernsImageError::NotOneRange(format!("uid {:?}, gid {:?}", self.uid, self.gid))),
        }
    }
}

fn malformed(what: impl Into<String>) -> UsernsImageError {
    UsernsImageError::Malformed(what.into())
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, UsernsImageError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at).ok_or_else(|| malformed("truncated varint"))?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(malformed("varint longer than 10 bytes"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn extent(buf: &[u8]) -> Result<Extent, UsernsImageError> {
    let (mut at, mut fields) = (0, [None; 3]);
    while at < buf.len() {
        let key = varint(buf, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        if wire != 0 || !(1..=3).contains(&field) {
            return Err(malformed(format!("unexpected field {field} (wire type {wire}) in an id extent")));
        }
        let v = u32::try_from(varint(buf, &mut at)?).map_err(|_| malformed("id above 2^32"))?;
        fields[field as usize - 1] = Some(v);
    }
    match fields {
        [Some(first), Some(lower_first), Some(count)] => Ok(Extent { first, lower_first, count }),
        _ => Err(malformed("an id extent lacks a required field")),
    }
}

/// Decodes the bytes of a `userns-N.img`.
pub fn decode(file: &[u8]) -> Result<UsernsMaps, UsernsImageError> {
    let word = |at: usize| file.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    if word(0) != Some(COMMON_MAGIC) || word(4) != Some(USERNS_MAGIC) {
        return Err(malformed("not a CRIU user-namespace image (magic)"));
    }
    let len = word(8).ok_or_else(|| malformed("no entry"))? as usize;
    if len > MAX_ENTRY || file.len() != 12 + len {
        return Err(malformed(format!("entry of {len} bytes in a file of {} (one entry expected)", file.len())));
    }
    let msg = &file[12..];
    let (mut at, mut maps) = (0, UsernsMaps::default());
    while at < msg.len() {
        let key = varint(msg, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        if wire != 2 || !(1..=2).contains(&field) {
            return Err(malformed(format!("unexpected field {field} (wire type {wire}) in the user-namespace entry")));
        }
        let n = varint(msg, &mut at)? as usize;
        let body = msg.get(at..at + n).ok_or_else(|| malformed("truncated id extent"))?;
        at += n;
        let e = extent(body)?;
        if field == 1 {
            maps.uid.push(e)
        } else {
            maps.gid.push(e)
        }
    }
    Ok(maps)
}

/// Encodes `maps` as CRIU writes a `userns-N.img`.
pub fn encode(maps: &UsernsMaps) -> Vec<u8> {
    let mut msg = Vec::new();
    for (field, list) in [(1u64, &maps.uid), (2, &maps.gid)] {
        for e in list {
            let mut body = Vec::new();
            for (f, v) in [(1u64, e.first), (2, e.lower_first), (3, e.count)] {
                put_varint(&mut body, f << 3);
                put_varint(&mut body, u64::from(v));
            }
            put_varint(&mut msg, (field << 3) | 2);
            put_varint(&mut msg, body.len() as u64);
            msg.extend_from_slice(&body);
        }
    }
    let mut out = Vec::with_capacity(12 + msg.len());
    out.extend_from_slice(&COMMON_MAGIC.to_le_bytes());
    out.extend_from_slice(&USERNS_MAGIC.to_le_bytes());
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(&msg);
    out
}

/// The `userns-N.img` of an images directory, if the dumped tree had a user
/// namespace of its own (CRIU writes one per user namespace; strata's
/// sandboxes have at most one).
pub fn find(images_dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut found = None;
    for e in std::fs::read_dir(images_dir)? {
        let name = e?.file_name();
        let s = name.to_string_lossy();
        if s.starts_with("userns-") && s.ends_with(".img") {
            if found.is_some() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "more than one user namespace in the images",
                ));
            }
            found = Some(images_dir.join(&*s));
        }
    }
    Ok(found)
}

/// `maps` moved to the range starting at host id `host_base` (same size).
pub fn moved(maps: &UsernsMaps, host_base: u32) -> Result<UsernsMaps, UsernsImageError> {
    let (_, count) = maps.range()?;
    let e = Extent { first: 0, lower_first: host_base, count };
    Ok(UsernsMaps { uid: vec![e], gid: vec![e] })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What CRIU 4.1.1 wrote for a sandbox whose root is host id 1,000,262,144.
    const DUMPED: [u8; 40] = [
        0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55, 0x1c, 0x00, 0x00, 0x00, 0x0a, 0x0c, 0x08, 0x00, 0x10, 0x80,
        0x94, 0xfb, 0xdc, 0x03, 0x18, 0x80, 0x80, 0x04, 0x12, 0x0c, 0x08, 0x00, 0x10, 0x80, 0x94, 0xfb, 0xdc, 0x03,
        0x18, 0x80, 0x80, 0x04,
    ];

    #[test]
    fn criu_s_own_image_decodes_and_encodes_back_byte_for_byte() {
        let maps = decode(&DUMPED).unwrap();
        let e = Extent { first: 0, lower_first: 1_000_262_144, count: 65_536 };
        assert_eq!(maps, UsernsMaps { uid: vec![e], gid: vec![e] });
        assert_eq!(maps.range().unwrap(), (1_000_262_144, 65_536));
        assert_eq!(encode(&maps), DUMPED);
    }

    #[test]
    fn a_move_changes_only_the_host_ids() {
        let maps = decode(&DUMPED).unwrap();
        let to = moved(&maps, 1_000_065_536).unwrap();
        assert_eq!(to.range().unwrap(), (1_000_065_536, 65_536));
        let again = decode(&encode(&to)).unwrap();
        assert_eq!(again, to);
        // A small id (one-byte varint) round-trips too: lengths follow the content.
        let small = moved(&maps, 100).unwrap();
        assert_eq!(decode(&encode(&small)).unwrap(), small);
    }

    #[test]
    fn anything_but_criu_s_format_is_refused_with_why() {
        assert!(decode(&DUMPED[..20]).unwrap_err().to_string().contains("entry of 28 bytes"));
        let mut bad = DUMPED;
        bad[4] = 0;
        assert!(decode(&bad).unwrap_err().to_string().contains("magic"));
        // An unknown field in the entry (field 3, length-delimited).
        let mut extra = DUMPED.to_vec();
        extra[8] += 2;
        extra.extend_from_slice(&[0x1a, 0x00]);
        assert!(decode(&extra).unwrap_err().to_string().contains("unexpected field 3"), "{:?}", decode(&extra));
        // Maps that are not strata's single range cannot be moved.
        let two = UsernsMaps {
            uid: vec![Extent { first: 0, lower_first: 5, count: 1 }, Extent { first: 1, lower_first: 9, count: 1 }],
            gid: vec![],
        };
        assert!(matches!(moved(&two, 7), Err(UsernsImageError::NotOneRange(_))));
    }
}
