//! Process images: a CRIU dump of a sandbox's processes in a directory with
//! `manifest.json` (every file's size and CRC32), written to a staging
//! directory and renamed into place once complete, checked before it is
//! restored, retired (renamed, removed in the background) once used. A standby
//! image is one; a warm checkpoint's process image is another ([`crate::lifecycle::warm`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_api::StandbyInfo;
use tracing::{info, warn};

use crate::state::Shared;

/// Directory of a complete standby image, inside the sandbox's directory.
pub(crate) const IMAGE_DIR: &str = "standby";

/// Where an image is written before it is complete.
pub(crate) const STAGING_DIR: &str = "standby.tmp";

/// The manifest, written last.
pub(crate) const MANIFEST: &str = "manifest.json";

/// CRIU's log of the sandbox's last successful restore, in the sandbox's directory.
pub(crate) const LAST_RESTORE_LOG: &str = "criu-restore.last.log";

/// Prefix of a used image's directory while it is removed in the background
/// (renamed first, so the removal of a large image is off the resume's path).
pub(crate) const SPENT_PREFIX: &str = "standby.spent.";

/// `manifest.json` of a process image (a standby image, or a warm checkpoint's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) info: StandbyInfo,
    /// The strata-init binary the dumped processes run (bound again on restore).
    #[serde(default)]
    pub(crate) helper: Option<PathBuf>,
    /// Every image file with its size and CRC32.
    files: Vec<FileSum>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FileSum {
    name: String,
    size: u64,
    crc32: u32,
}

pub fn image_dir(st: &Shared, id: &str) -> PathBuf {
    st.sandbox_dir(id).join(IMAGE_DIR)
}

/// The standby image's description, when the sandbox has one.
pub fn info(st: &Shared, id: &str) -> Option<StandbyInfo> {
    read_manifest(&image_dir(st, id)).ok().map(|m| m.info)
}

pub(crate) fn read_manifest(dir: &Path) -> Result<Manifest, String> {
    let p = dir.join(MANIFEST);
    let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", p.display()))
}

/// Files at least this large are summed in parts, one thread per core (at
/// most 4), and the parts' CRCs combined: checking a 1 GiB image before a
/// resume is on the resume's path.
const PARALLEL_SUM_BYTES: u64 = 16 << 20;

/// The size and CRC32 of the file at `path`.
pub(crate) fn crc_of(path: &Path) -> std::io::Result<(u64, u32)> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let parts = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4) as u64;
    if size < PARALLEL_SUM_BYTES || parts < 2 {
        let mut h = crc32fast::Hasher::new();
        let size = strata_store::fsutil::for_each_chunk(path, |c| h.update(c))?;
        return Ok((size, h.finalize()));
    }
    let part = size.div_ceil(parts);
    let sums = std::thread::scope(|s| {
        let threads: Vec<_> = (0..parts)
            .map(|i| {
                let file = &file;
                s.spawn(move || sum_range(file, i * part, ((i + 1) * part).min(size)))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(std::io::Error::other("a summing thread panicked"))))
            .collect::<std::io::Result<Vec<_>>>()
    })?;
    let mut all = crc32fast::Hasher::new();
    let mut len = 0;
    for (n, h) in &sums {
        all.combine(h);
        len += n;
    }
    Ok((len, all.finalize()))
}

/// The CRC32 state of bytes `start..end` of `file` and how many there were
/// (fewer when the file ends first).
fn sum_range(file: &std::fs::File, start: u64, end: u64) -> std::io::Result<(u64, crc32fast::Hasher)> {
    use std::os::unix::fs::FileExt;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = start;
    while off < end {
        let want = ((end - off) as usize).min(buf.len());
        let n = file.read_at(&mut buf[..want], off)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok((off - start, h))
}

/// The image files of `dir`: every regular file but the manifest, by name.
fn image_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name != MANIFEST && e.file_type()?.is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The size and CRC32 of each of `names` in `dir`.
fn sums_of(dir: &Path, names: &[String]) -> std::io::Result<Vec<FileSum>> {
    names
        .iter()
        .map(|name| {
            let (size, crc32) = crc_of(&dir.join(name))?;
            Ok(FileSum { name: name.clone(), size, crc32 })
        })
        .collect()
}

/// Checks an image against its manifest: every listed file present with its size and CRC32.
pub(crate) fn verify(dir: &Path) -> Result<Manifest, String> {
    if !dir.is_dir() {
        return Err(format!("the process image {} is missing", dir.display()));
    }
    let m = read_manifest(dir)?;
    for f in &m.files {
        let p = dir.join(&f.name);
        match crc_of(&p) {
            Ok((size, crc)) if size == f.size && crc == f.crc32 => {}
            Ok((size, crc)) => {
                return Err(format!(
                    "process image file {} is corrupt ({size} bytes, crc32 {crc:08x}; expected {} bytes, crc32 {:08x})",
                    f.name, f.size, f.crc32
                ))
            }
            Err(e) => return Err(format!("process image file {}: {e}", f.name)),
        }
    }
    Ok(m)
}

/// Writes `manifest.json` into `dir` (temp + fsync + rename) and syncs the files it lists.
/// The files are flushed to disk on a thread of their own while they are summed
/// (from the page cache): the two overlap instead of adding up.
pub(crate) fn seal(dir: &Path, info: StandbyInfo, helper: Option<PathBuf>) -> std::io::Result<Manifest> {
    let names = image_files(dir)?;
    let (files, synced) = std::thread::scope(|s| {
        let sync = s.spawn(|| -> std::io::Result<()> {
            for name in &names {
                std::fs::File::open(dir.join(name))?.sync_all()?;
            }
            Ok(())
        });
        let files = sums_of(dir, &names);
        (files, sync.join().unwrap_or_else(|_| Err(std::io::Error::other("the sync thread panicked"))))
    });
    let files = files?;
    synced?;
    // What the image takes on disk: a sparse file (a microVM's RAM) counts its data only.
    let image_bytes = names
        .iter()
        .map(|n| {
            std::fs::metadata(dir.join(n)).map(|m| (std::os::unix::fs::MetadataExt::blocks(&m) * 512).min(m.len()))
        })
        .sum::<std::io::Result<u64>>()?;
    let m = Manifest { info: StandbyInfo { image_bytes, ..info }, helper, files };
    strata_store::fsutil::write_atomic(
        &dir.join(MANIFEST),
        &serde_json::to_vec_pretty(&m).expect("manifest serializes"),
        0o600,
    )?;
    Ok(m)
}

/// Renames a complete staging directory into place (replacing an old image) and syncs the parent.
pub(crate) fn publish(staging: &Path, dir: &Path) -> std::io::Result<()> {
    strata_store::fsutil::remove_dir_all_if_exists(dir)?;
    std::fs::rename(staging, dir)?;
    std::fs::File::open(dir.parent().expect("has parent"))?.sync_all()
}

/// Drops a sandbox's standby image (it was stopped or destroyed from standby).
pub fn discard(st: &Shared, id: &str) {
    st.processes.abandon_suspended(id);
    for d in [IMAGE_DIR, STAGING_DIR] {
        let _ = strata_store::fsutil::remove_dir_all_if_exists(&st.sandbox_dir(id).join(d));
    }
    sweep_spent(st, id);
}

/// Moves a used standby image out of the way (one rename) and removes it in the
/// background: unlinking ~100 MiB of pages is not on the resume's critical path.
/// A daemon that dies before the removal finishes sweeps it at start ([`sweep_spent`]).
pub(crate) fn retire_image(st: &Shared, id: &str) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let spent = st.sandbox_dir(id).join(format!("{SPENT_PREFIX}{}.{n}", std::process::id()));
    let dir = image_dir(st, id);
    let target = match std::fs::rename(&dir, &spent) {
        Ok(()) => spent,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            warn!(sandbox = %id, error = %e, "moving the used standby image aside; removing it in place");
            dir
        }
    };
    let id = id.to_string();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = strata_store::fsutil::remove_dir_all_if_exists(&target) {
            warn!(sandbox = %id, error = %e, "removing the used standby image");
        }
    });
}

/// Removes used images a previous daemon left half-removed (`retire_image`).
pub fn sweep_spent(st: &Shared, id: &str) {
    let Ok(entries) = std::fs::read_dir(st.sandbox_dir(id)) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(SPENT_PREFIX) {
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&e.path());
        }
    }
}

/// A running sandbox (re-adopted after a daemon restart) has no use for a
/// standby image: one left there was restored from by a daemon that died
/// before removing it.
pub fn drop_stale_image(st: &Shared, id: &str) {
    if image_dir(st, id).is_dir() {
        info!(sandbox = %id, "removing a standby image already restored from");
        retire_image(st, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_api::StandbyMode;

    #[test]
    fn a_large_file_summed_in_parts_has_the_crc_of_the_whole() {
        let d = tempfile::tempdir().unwrap();
        // Not a multiple of the part size, nor of the read buffer.
        let data: Vec<u8> =
            (0..(PARALLEL_SUM_BYTES as usize + 3 * 1024 * 1024 + 17)).map(|i| (i * 7 + i / 4096) as u8).collect();
        let p = d.path().join("pages-1.img");
        std::fs::write(&p, &data).unwrap();
        assert_eq!(crc_of(&p).unwrap(), (data.len() as u64, crc32fast::hash(&data)));
        let small = d.path().join("core-1.img");
        std::fs::write(&small, &data[..4096]).unwrap();
        assert_eq!(crc_of(&small).unwrap(), (4096, crc32fast::hash(&data[..4096])));
    }

    #[test]
    fn sealed_images_verify_and_corruption_is_named() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("pages-1.img"), vec![7u8; 100_000]).unwrap();
        std::fs::write(d.path().join("core-1.img"), b"core").unwrap();
        let info = StandbyInfo {
            mode: StandbyMode::Processes,
            created_at: "t".into(),
            image_bytes: 0,
            api_processes: 1,
            dump_ms: 3,
            note: None,
        };
        let m = seal(d.path(), info.clone(), None).unwrap();
        assert_eq!(m.info.image_bytes, 100_004);
        assert_eq!(m.files.len(), 2);
        // A sparse file (a microVM's RAM) counts what it holds, not its length.
        let sparse = d.path().join("ram");
        let f = std::fs::File::create(&sparse).unwrap();
        f.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 4096], 1 << 20).unwrap();
        drop(f);
        let m = seal(d.path(), info, None).unwrap();
        assert!(m.info.image_bytes < 100_004 + (1 << 20), "{}", m.info.image_bytes);
        std::fs::remove_file(&sparse).unwrap();
        seal(d.path(), m.info.clone(), None).unwrap();
        assert!(verify(d.path()).is_ok());
        // Flip one byte: refused, naming the file.
        let mut bytes = std::fs::read(d.path().join("pages-1.img")).unwrap();
        bytes[500] ^= 1;
        std::fs::write(d.path().join("pages-1.img"), bytes).unwrap();
        let err = verify(d.path()).unwrap_err();
        assert!(err.contains("pages-1.img") && err.contains("corrupt"), "{err}");
        // A missing file is named too; a missing directory says so.
        std::fs::remove_file(d.path().join("core-1.img")).unwrap();
        assert!(verify(d.path()).unwrap_err().contains("core-1.img"));
        assert!(verify(&d.path().join("nope")).unwrap_err().contains("missing"));
    }
}
