//! A microVM's two disks.
//!
//! * **The lower disk** (read-only): the sandbox's layer chain
//!   as one ext4 image, built once per chain with `mkfs.ext4 -d` from the
//!   chain's read-only overlay ([`lower_image`]) and shared by every sandbox
//!   of that chain (QEMU opens it `readonly=on`). A chain is immutable, so
//!   its image never changes; the cache key is the digest of its layer
//!   directories.
//! * **The sandbox's disk**: the sandbox's disk image ([`crate::disk`]: a
//!   sparse ext4 of its disk limit in its directory, made by the engine's
//!   disk pool, or here ([`sandbox_disk`]) when it has no limit), whose
//!   `upper/` and `work/` the guest joins with the lower disk in an overlay.
//!   It lives as long as the sandbox (stop and start keep it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest;

use crate::RuntimeError;

/// File name of a sandbox's own disk in its directory: the namespace tier's
/// disk image, so the engine finds its writable layer where it finds theirs.
pub const SANDBOX_DISK: &str = crate::disk::IMAGE;

/// Size of a sandbox's disk when it has no disk limit.
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;

/// Room left in a lower image beyond its files (ext4's own metadata, slack).
const LOWER_SLACK: u64 = 64 << 20;

/// Serializes lower-image builds (two creates of one new chain build it once).
static BUILD_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes `bytes` to `path` atomically (a temporary file beside it, fsync,
/// rename, fsync of the directory): strata-store's `fsutil::write_atomic`
/// for this crate, which does not depend on the store.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        RuntimeError::sys(format!("write {}", path.display()), e)
    })
}

fn mkfs() -> Result<PathBuf, RuntimeError> {
    crate::probe::find_tool("mkfs.ext4")
        .ok_or_else(|| RuntimeError::Unsupported("mkfs.ext4 is not installed (e2fsprogs)".into()))
}

fn run_mkfs(args: &[&str], image: &Path) -> Result<(), RuntimeError> {
    let out = Command::new(mkfs()?)
        .args(args)
        .arg(image)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|source| RuntimeError::Spawn { what: "mkfs.ext4", source })?;
    if !out.status.success() {
        return Err(RuntimeError::Setup(format!(
            "mkfs.ext4 {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Bytes and inodes a tree takes (4 KiB blocks, directories and files alike).
fn measure(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.path().symlink_metadata() else { continue };
            inodes += 1;
            bytes += md.len().div_ceil(4096) * 4096 + 4096;
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// The cache file of the chain `lower_dirs` (bottom first) under `cache_dir`.
pub fn lower_image_path(cache_dir: &Path, lower_dirs: &[PathBuf]) -> PathBuf {
    let mut h = sha2::Sha256::new();
    for d in lower_dirs {
        h.update(d.as_os_str().as_encoded_bytes());
        h.update(b"\n");
    }
    let digest: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    // v2: the tree in a directory of the image (LOWER_TREE).
    cache_dir.join("lower").join(format!("{digest}-v2.ext4"))
}

/// The chain's ext4 image, built the first time (see the module docs).
pub fn lower_image(cache_dir: &Path, lower_dirs: &[PathBuf]) -> Result<PathBuf, RuntimeError> {
    let path = lower_image_path(cache_dir, lower_dirs);
    if path.is_file() {
        return Ok(path);
    }
    let _g = BUILD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if path.is_file() {
        return Ok(path);
    }
    let dir = path.parent().expect("lower/ parent");
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::sys(format!("create {}", dir.display()), e))?;
    let t = std::time::Instant::now();
    let staged = path.with_extension(format!("staged-{}", std::process::id()));
    let built = build_lower(lower_dirs, &staged).and_then(|()| {
        std::fs::rename(&staged, &path).map_err(|e| RuntimeError::sys(format!("rename to {}", path.display()), e))
    });
    if built.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    built?;
    tracing::info!(layers = lower_dirs.len(), ms = t.elapsed().as_millis() as u64, image = %path.display(), "built a microVM lower disk");
    Ok(path)
}

/// Where the chain's tree is in its image: a directory of the root, so that
/// the file system's own `lost+found` stays out of the sandbox's `/`.
pub use strata_init::vm::LOWER_TREE;

fn build_lower(lower_dirs: &[PathBuf], image: &Path) -> Result<(), RuntimeError> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    if lower_dirs.is_empty() {
        return Err(RuntimeError::Image("a sandbox without layers".into()));
    }
    // The chain as the sandbox sees it at <staging>/fs: the one layer bound
    // there, or a read-only overlay of them all (top first).
    let staging = image.with_extension("tree");
    let tree = staging.join(LOWER_TREE);
    std::fs::create_dir_all(&tree).map_err(|e| RuntimeError::sys(format!("create {}", tree.display()), e))?;
    let mounted = match lower_dirs {
        [one] => mount(Some(one.as_path()), &tree, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>),
        many => {
            let lower: Vec<String> = many.iter().rev().map(|d| d.to_string_lossy().into_owned()).collect();
            let data = format!("lowerdir={}", lower.join(":"));
            mount(Some("overlay"), &tree, Some("overlay"), MsFlags::MS_RDONLY, Some(data.as_str()))
        }
    };
    let r = match mounted {
        Ok(()) => {
            let r = mkfs_from(&staging, image);
            let _ = umount2(&tree, MntFlags::MNT_DETACH);
            r
        }
        Err(e) => Err(RuntimeError::sys("mount the chain for its image", std::io::Error::from(e))),
    };
    let _ = std::fs::remove_dir(&tree);
    let _ = std::fs::remove_dir(&staging);
    r
}

/// `mkfs.ext4 -d TREE` into a new sparse image sized for the tree.
fn mkfs_from(tree: &Path, image: &Path) -> Result<(), RuntimeError> {
    let (bytes, inodes) = measure(tree);
    let size = (bytes + bytes / 8 + LOWER_SLACK).div_ceil(1 << 20) << 20;
    let f = std::fs::File::create(image).map_err(|e| RuntimeError::sys(format!("create {}", image.display()), e))?;
    f.set_len(size).map_err(|e| RuntimeError::sys(format!("size {}", image.display()), e))?;
    drop(f);
    let inodes = (inodes + inodes / 4 + 1024).to_string();
    let tree = tree.to_string_lossy();
    // No journal: the guest mounts it read-only.
    run_mkfs(
        &["-q", "-F", "-m", "0", "-O", "^has_journal", "-N", &inodes, "-L", strata_init::vm::LOWER_LABEL, "-d", &tree],
        image,
    )
}

/// The sandbox's own disk in `sandbox_dir`, made (empty, sparse, `bytes`
/// big) when it does not exist yet.
pub fn sandbox_disk(sandbox_dir: &Path, bytes: u64) -> Result<PathBuf, RuntimeError> {
    let path = sandbox_dir.join(SANDBOX_DISK);
    if path.is_file() {
        return Ok(path);
    }
    let staged = sandbox_dir.join(format!("{SANDBOX_DISK}.staged"));
    let make = || -> Result<(), RuntimeError> {
        std::fs::create_dir_all(sandbox_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", sandbox_dir.display()), e))?;
        let f =
            std::fs::File::create(&staged).map_err(|e| RuntimeError::sys(format!("create {}", staged.display()), e))?;
        f.set_len(bytes).map_err(|e| RuntimeError::sys(format!("size {}", staged.display()), e))?;
        drop(f);
        // The same file system as the namespace tier's disks (label `strata-disk`, which the guest looks for).
        debug_assert!(crate::disk::MKFS_ARGS.contains(&strata_init::vm::DISK_LABEL));
        run_mkfs(&crate::disk::MKFS_ARGS, &staged)?;
        std::fs::rename(&staged, &path).map_err(|e| RuntimeError::sys(format!("rename to {}", path.display()), e))
    };
    make().inspect_err(|_| {
        let _ = std::fs::remove_file(&staged);
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_s_image_is_named_by_its_layers_and_made_once() {
        let d = tempfile::tempdir().unwrap();
        let a = vec![PathBuf::from("/l/a"), PathBuf::from("/l/b")];
        let b = vec![PathBuf::from("/l/a"), PathBuf::from("/l/c")];
        assert_ne!(lower_image_path(d.path(), &a), lower_image_path(d.path(), &b));
        assert_eq!(lower_image_path(d.path(), &a), lower_image_path(d.path(), &a.clone()));
        if crate::probe::find_tool("mkfs.ext4").is_none() {
            println!("skipped the build: mkfs.ext4 is not installed");
            return;
        }
        if !nix::unistd::geteuid().is_root() {
            // (The suite runs it as root; scripts/unit-as-nobody.sh runs the unit tests without.)
            println!("skipped the build: it mounts the layer chain, which takes root");
            return;
        }
        let layer = d.path().join("layer");
        std::fs::create_dir_all(layer.join("etc")).unwrap();
        std::fs::write(layer.join("etc/hello"), "hi\n").unwrap();
        let img = lower_image(d.path(), std::slice::from_ref(&layer)).unwrap();
        let size = img.metadata().unwrap().len();
        assert!((LOWER_SLACK..LOWER_SLACK * 2).contains(&size), "{size}");
        let again = lower_image(d.path(), &[layer]).unwrap();
        assert_eq!(img, again);
        let disk = sandbox_disk(d.path(), 64 << 20).unwrap();
        assert_eq!(disk.metadata().unwrap().len(), 64 << 20);
        assert!(!d.path().join(format!("{SANDBOX_DISK}.staged")).exists());
    }
}
