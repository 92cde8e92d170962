//! Finding, checking and pinning the static `strata-init` binary that runs
//! inside every sandbox.
//!
//! The daemon keeps a content-addressed copy under `<state>/bin/`, so sandboxes
//! in standby (whose process images refer to the binary they were started
//! with) stay resumable after strata is rebuilt or upgraded.

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
        (None, None) => return Err(InitBinaryError::NotFound(list.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))),
    };
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    let dest = state_dir.join("bin").join(format!("strata-init-{}", &digest[..16]));
    if !dest.is_file() {
        let dir = dest.parent().expect("has parent");
        std::fs::create_dir_all(dir).map_err(|source| InitBinaryError::Io { what: "create", path: dir.to_path_buf(), source })?;
        strata_store::fsutil::write_atomic(&dest, &bytes, 0o755).map_err(|source| InitBinaryError::Io { what: "write", path: dest.clone(), source })?;
    }
    Ok(dest)
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
