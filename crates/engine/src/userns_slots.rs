//! Which user-namespace slots this daemon's sandboxes take, host-wide.
//!
//! Every daemon allocates sandbox uid ranges from its own database; two
//! daemons on one host (a second state directory, the test suite's daemons)
//! would otherwise hand out the same host ids. The host's slots are cut into
//! [`BLOCKS`] blocks of [`BLOCK_SLOTS`]; a daemon claims one the first time
//! it opens its state directory and keeps it: the block's number is in
//! `<state>/userns-block`, and a registry file per block
//! (`/var/lib/strata/userns/<block>`) names the state directory that owns
//! it. A claim whose state directory is gone (or names another block now) is
//! stale and may be taken again. Claims are made under an exclusive `flock`
//! of the registry, and every file is written atomically.

use std::io::Write;
use std::path::{Path, PathBuf};

use strata_store::db::USERNS_SLOTS;

/// Where the claims are kept (host-wide, outside any state directory).
pub const REGISTRY: &str = "/var/lib/strata/userns";
/// Slots per block (ranges of 65,536 ids each).
pub const BLOCK_SLOTS: u32 = 1000;
/// How many blocks the host's slots make.
pub const BLOCKS: u32 = USERNS_SLOTS / BLOCK_SLOTS;
/// The state directory's record of its block.
pub const STATE_FILE: &str = "userns-block";

/// Why no block could be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// A file of the registry or the state directory.
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
    /// The state directory's block is claimed by another live state directory.
    #[error("user-namespace block {block} of this state directory is also claimed by {other} (was the state directory copied?); remove {} to let this daemon take another block", state_file.display())]
    Taken {
        /// The block.
        block: u32,
        /// The other owner.
        other: String,
        /// This state directory's record.
        state_file: PathBuf,
    },
    /// Every block is claimed by a live state directory.
    #[error("all {BLOCKS} user-namespace blocks of this host are claimed by other state directories (see {REGISTRY})")]
    Full,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ClaimError + 'a {
    move |source| ClaimError::Io { what, path: path.to_path_buf(), source }
}

/// Writes `data` to `path` atomically (temp file, fsync, rename).
fn write_atomic(path: &Path, data: &str) -> Result<(), ClaimError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
    f.write_all(data.as_bytes()).and_then(|_| f.sync_all()).map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename", path))
}

/// The block `state_dir` records, if it does.
fn recorded(state_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(state_dir.join(STATE_FILE)).ok()?.trim().parse().ok()
}

/// Claims this daemon's block (keeping the one its state directory has)
/// and returns its slots. `registry` is [`REGISTRY`] but in tests.
pub fn claim(state_dir: &Path, registry: &Path) -> Result<std::ops::Range<u32>, ClaimError> {
    let me = state_dir.canonicalize().map_err(io("resolve", state_dir))?;
    std::fs::create_dir_all(registry).map_err(io("create", registry))?;
    let lock_path = registry.join(".lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io("open", &lock_path))?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| ClaimError::Io { what: "lock", path: lock_path.clone(), source: e.into() })?;
    let owner = |block: u32| std::fs::read_to_string(registry.join(block.to_string())).ok().map(PathBuf::from);
    // A claim is live while its state directory still records that block.
    let live_elsewhere = |block: u32| owner(block).filter(|p| *p != me && recorded(p) == Some(block));
    let block = match recorded(&me) {
        Some(b) if b < BLOCKS => {
            if let Some(other) = live_elsewhere(b) {
                return Err(ClaimError::Taken {
                    block: b,
                    other: other.display().to_string(),
                    state_file: me.join(STATE_FILE),
                });
            }
            b
        }
        _ => (0..BLOCKS).find(|b| live_elsewhere(*b).is_none()).ok_or(ClaimError::Full)?,
    };
    if owner(block).as_deref() != Some(me.as_path()) {
        write_atomic(&registry.join(block.to_string()), &me.to_string_lossy())?;
    }
    if recorded(&me) != Some(block) {
        write_atomic(&me.join(STATE_FILE), &format!("{block}\n"))?;
    }
    Ok(block * BLOCK_SLOTS..(block + 1) * BLOCK_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_directory_keeps_a_block_of_its_own_and_stale_claims_are_taken_again() {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join("registry");
        let dir = |n: &str| {
            let p = root.path().join(n);
            std::fs::create_dir_all(&p).unwrap();
            p
        };
        let (a, b, c) = (dir("a"), dir("b"), dir("c"));
        assert_eq!(claim(&a, &registry).unwrap(), 0..1000);
        assert_eq!(claim(&b, &registry).unwrap(), 1000..2000, "the next free block");
        assert_eq!(claim(&a, &registry).unwrap(), 0..1000, "a restart keeps its block");
        // A state directory that is gone leaves a stale claim: the next one takes it.
        std::fs::remove_dir_all(&a).unwrap();
        assert_eq!(claim(&c, &registry).unwrap(), 0..1000);
        assert_eq!(std::fs::read_to_string(c.join(STATE_FILE)).unwrap(), "0\n");
        // A copied state directory (two live owners of one block) is refused with why.
        let copy = dir("copy");
        std::fs::copy(c.join(STATE_FILE), copy.join(STATE_FILE)).unwrap();
        let err = claim(&copy, &registry).unwrap_err().to_string();
        assert!(err.contains("block 0") && err.contains("copied"), "{err}");
        // All blocks held by live directories: refused.
        for i in 2..BLOCKS {
            claim(&dir(&format!("d{i}")), &registry).unwrap();
        }
        assert!(matches!(claim(&dir("late"), &registry), Err(ClaimError::Full)));
    }
}
