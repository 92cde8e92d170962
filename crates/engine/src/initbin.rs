//! Finding, checking and pinning the static `strata-init` binary that runs
//! inside every sandbox.
//!
//! The daemon keeps a content-addressed copy under `<state>/bin/`, so sandboxes
//! in standby (whose process images refer to the binary they were started
//! with) stay resumable after strata is rebuilt or upgraded. Sandboxes
//! bind-mount it from a tmpfs of the daemon's ([`serve`]), so that what a
//! sandbox sees of the mount (its mountinfo, its processes' names) names no
//! host path.

use std::path::{Path, PathBuf};

use sha2::Digest;

/// Errors finding or pinning strata-init.
#[derive(Debug, thiserror::Error)]
pub enum InitBinaryError {
    /// No candidate path holds the binary.
    #[error("strata-init not found (looked in {0}); build it with scripts/build-init.sh or pass --init-binary")]
    NotFound(String),
    /// The binary needs a dynamic loader.
    #[error("{0} is dynamically linked; strata-init must be static (scripts/build-init.sh builds it so) because it runs inside sandboxes")]
    Dynamic(PathBuf),
    /// Mounting the tmpfs the binary is served from failed.
    #[error("mount a tmpfs on {}: {source}", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// Reading or copying failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Where strata-init is looked for, in order: `explicit`, next to `strata_exe`,
/// the static build of a source tree (`target/x86_64-unknown-linux-gnu/release`
/// beside the profile directory of `strata_exe`), /usr/local/lib/strata.
pub fn candidates(explicit: Option<&Path>, strata_exe: &Path) -> Vec<PathBuf> {
    if let Some(p) = explicit {
        return vec![p.to_path_buf()];
    }
    let mut out = Vec::new();
    if let Some(dir) = strata_exe.parent() {
        out.push(dir.join("strata-init"));
        // target/<profile>/strata (or target/<profile>/deps/.. for tests)
        for up in dir.ancestors().skip(1).take(2) {
            out.push(up.join("x86_64-unknown-linux-gnu/release/strata-init"));
        }
    }
    out.push(PathBuf::from("/usr/local/lib/strata/strata-init"));
    out
}

/// Whether an ELF image asks for a program interpreter (is dynamically linked).
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 {
        return true; // not a 64-bit ELF: refuse it the same way
    }
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into().expect("8 bytes")) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        elf.get(o..o + 4).is_some_and(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")) == PT_INTERP)
    })
}

/// Finds strata-init, checks that it is static, and returns its pinned copy
/// `<state>/bin/strata-init-<sha256 prefix>` (written atomically once).
pub fn pin(explicit: Option<&Path>, strata_exe: &Path, state_dir: &Path) -> Result<PathBuf, InitBinaryError> {
    let list = candidates(explicit, strata_exe);
    // The first static candidate wins (a plain `cargo build` also leaves a
    // dynamically linked strata-init next to strata: skip it).
    let mut dynamic = None;
    let mut found = None;
    for p in list.iter().filter(|p| p.is_file()) {
        let bytes = std::fs::read(p).map_err(|source| InitBinaryError::Io { what: "read", path: p.clone(), source })?;
        if has_interpreter(&bytes) {
            dynamic.get_or_insert_with(|| p.clone());
        } else {
            found = Some(bytes);
            break;
        }
    }
    let bytes = match (found, dynamic) {
        (Some(b), _) => b,
        (None, Some(d)) => return Err(InitBinaryError::Dynamic(d)),
        (None, None) => {
            return Err(InitBinaryError::NotFound(
                list.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            ))
        }
    };
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    let dest = state_dir.join("bin").join(format!("strata-init-{}", &digest[..16]));
    if !dest.is_file() {
        let dir = dest.parent().expect("has parent");
        std::fs::create_dir_all(dir).map_err(|source| InitBinaryError::Io {
            what: "create",
            path: dir.to_path_buf(),
            source,
        })?;
        strata_store::fsutil::write_atomic(&dest, &bytes, 0o755).map_err(|source| InitBinaryError::Io {
            what: "write",
            path: dest.clone(),
            source,
        })?;
    }
    Ok(dest)
}

/// Where the tmpfs of every daemon's served strata-init copies is mounted:
/// outside the state directories (which stay 0700), so that a restore of a
/// sandbox in a user namespace, which CRIU's restored task does as the
/// sandbox's root, can open the binary its images name.
pub const SERVE_ROOT: &str = "/run/strata-helpers";

/// The tmpfs sandboxes bind-mount strata-init from:
/// `/run/strata-helpers/<first 16 hex of sha256(state directory)>`, one per
/// daemon (mode 0711: the served binaries are readable, not listable).
pub fn serve_dir(state_dir: &Path) -> PathBuf {
    use sha2::Digest;
    let canonical = state_dir.canonicalize().unwrap_or_else(|_| state_dir.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let key: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Path::new(SERVE_ROOT).join(key)
}

/// File name of every served copy (what a sandbox's `ps` shows for pid 1 and the shims).
const SERVED_NAME: &str = "strata-init";

/// Serves every pinned strata-init (`<state>/bin/strata-init-<hash>`) at
/// `<serve_dir>/<hash>/strata-init` on a tmpfs mounted there ([`serve_dir`]) (once; an
/// existing tmpfs from an earlier run is reused), and returns the served path
/// of `pinned`. A bind mount of a file shows the file's path within its
/// filesystem to whoever reads the mount table: on the state directory's
/// filesystem that is a host path, on this tmpfs it is `/<hash>/strata-init`.
/// Older pinned copies are served too, so process images made with them
/// (standby, warm checkpoints) still restore after a reboot.
pub fn serve(pinned: &Path, state_dir: &Path) -> Result<PathBuf, InitBinaryError> {
    let dir = serve_dir(state_dir);
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| InitBinaryError::Io { what, path, source }
    };
    // Traversable by every id (whatever the daemon's umask), as the served files are readable.
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let root = Path::new(SERVE_ROOT);
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(&dir).map_err(io("create", &dir))?;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).map_err(io("chmod", root))?;
    }
    let on_tmpfs = nix::sys::statfs::statfs(&dir).is_ok_and(|f| f.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    if !on_tmpfs {
        let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV;
        nix::mount::mount(Some("strata-helper"), &dir, Some("tmpfs"), flags, Some("mode=0711,size=256m"))
            .map_err(|source| InitBinaryError::Mount { path: dir.clone(), source })?;
    }
    let bin = pinned.parent().expect("a pinned path has a parent");
    for entry in std::fs::read_dir(bin).map_err(io("list", bin))? {
        let entry = entry.map_err(io("list", bin))?;
        let name = entry.file_name();
        let Some(hash) = name
            .to_str()
            .and_then(|n| n.strip_prefix("strata-init-"))
            .filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
        else {
            continue;
        };
        let served = dir.join(hash).join(SERVED_NAME);
        if served.is_file() {
            continue;
        }
        let bytes = std::fs::read(entry.path()).map_err(io("read", &entry.path()))?;
        std::fs::create_dir_all(served.parent().expect("has parent")).map_err(io("create", &served))?;
        strata_store::fsutil::write_atomic(&served, &bytes, 0o555).map_err(io("write", &served))?;
    }
    let hash = pinned
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("strata-init-"))
        .expect("pin names copies strata-init-<hash>");
    Ok(dir.join(hash).join(SERVED_NAME))
}

/// Detaches the tmpfs of [`serve`] (at shutdown): running sandboxes keep their
/// bind mounts of it; the next start serves the binaries again.
pub fn unserve(state_dir: &Path) {
    let dir = serve_dir(state_dir);
    if nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH).is_ok() {
        let _ = std::fs::remove_dir(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_binaries_are_recognised() {
        // The test binary itself is dynamically linked (no crt-static in tests).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(has_interpreter(&me));
        assert!(has_interpreter(b"#!/bin/sh\necho not an ELF\n"));
    }

    #[test]
    fn candidates_prefer_the_explicit_path() {
        let c = candidates(Some(Path::new("/x/strata-init")), Path::new("/work/target/debug/strata"));
        assert_eq!(c, vec![PathBuf::from("/x/strata-init")]);
        let c = candidates(None, Path::new("/work/target/debug/strata"));
        assert_eq!(c[0], PathBuf::from("/work/target/debug/strata-init"));
        assert!(c.contains(&PathBuf::from("/work/target/x86_64-unknown-linux-gnu/release/strata-init")));
    }
}
